"""RoPE as an HF config.json says it: θ and the scaling (`RopeScaling`) from `rope_theta` and `rope_scaling`, or
transformers 5's `rope_parameters` (θ inside), validated once (`read_rope`: a ConfigError naming the key), and a Phi3's
RoPE on part of each head (`rotary_fraction`) and longrope (`fit_to_heads`); the numbers the models
compute from a scaling (`RopeScaling.yarn_band`, `RopeScaling.attention_scaling`: transformers 5's
`modeling_rope_utils`); the longest sequence vLLM derives from it (`max_positions`), and the context past which a
longrope model's engines and trainer would disagree (`longrope_refusal`). Torch is not imported here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rlctl.errors import ConfigError

ROPE_SUPPORTED = "default RoPE (rope_theta), 'linear', 'llama3' and 'yarn' scaling"
# a Phi3's (Phi3Config takes no other scaling): RoPE on part of each head besides (`rotary_fraction`)
PHI3_ROPE_SUPPORTED = " for Phi3: default RoPE (rope_theta) and 'longrope' scaling"
# each scaling's keys beside rope_type and θ: (those it needs, those it may have)
_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    # (llama3's and yarn's pretraining context, where config.json has none, is max_position_embeddings: `resolved`)
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
    "yarn": (
        ("factor",),
        (
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "attention_factor",
            "truncate",
        ),
    ),
    # (its pretraining context is a Phi3's top-level original_max_position_embeddings: `fit_to_heads`)
    "longrope": (("short_factor", "long_factor"), ("factor", "attention_factor", "original_max_position_embeddings")),
}
_PHI3_KINDS = ("default", "longrope")  # Phi3Config refuses the others
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # transformers' (the YaRN paper's) where config.json has none

Bad = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies θ^(-2i/d) are scaled for a context longer than the pretraining one (HF `rope_scaling`,
    or transformers 5's `rope_parameters`); no scaling is `TinyGPTConfig.rope_scaling` None. L below is the pretraining
    context, original_max_position_embeddings.

        linear  every frequency ÷ factor (the same as positions ÷ factor)
        llama3  by wavelength 2π/freq against L: shorter than L/high_freq_factor kept, longer than L/low_freq_factor
                ÷ factor, and in between interpolated linearly in L/wavelength (Llama 3.1–3.3: factor 8 or 32, 1, 4,
                L 8192)
        yarn    by dimension: those turning more than beta_fast times over L kept, fewer than beta_slow ÷ factor,
                a linear ramp in the dimension's index between (`yarn_band`); and cos and sin × `attention_scaling`
                (Qwen2.5/Qwen3 long context: factor 4, L 32768)
        longrope  each frequency ÷ its own number: short_factor's for a pass over at most L positions, long_factor's
                for a longer one (transformers chooses by the pass's length: `TinyGPT`); cos and sin ×
                `attention_scaling` in both (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini: L 4096)

    The fields are config.json's keys, None where it has none (`to_hf` writes back what was read), but longrope's L:
    a Phi3's top-level original_max_position_embeddings (transformers reads that one), always set. llama3's and yarn's
    L where config.json has none is the model's max_position_embeddings, as transformers 5's `standardize_rope_params`
    sets it (and vLLM, which calls it): the computations take a scaling `resolved` against the model.
    """

    kind: Literal["linear", "llama3", "yarn", "longrope"]
    factor: float | None  # None: longrope's where config.json has none
    low_freq_factor: float | None = None  # llama3's
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None  # llama3's and yarn's
    beta_fast: float | None = None  # yarn's, each optional
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool | None = None
    short_factor: tuple[float, ...] | None = None  # longrope's, one number per frequency (rotary_dim / 2)
    long_factor: tuple[float, ...] | None = None

    def to_hf(self) -> dict[str, Any]:
        """The `rope_scaling` entry of config.json (transformers 4 and 5, and vLLM, read it)."""
        said = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if v is not None}
        return {"rope_type": said.pop("kind"), **said}

    def attention_scaling(self, max_position_embeddings: int | None = None) -> float:
        """What cos and sin are multiplied by (so q·k by its square): yarn's and longrope's attention_factor, or where
        config.json has none, yarn's 0.1·ln(factor) + 1 (`_yarn_mscale`; with mscale and mscale_all_dim both given,
        the ratio of theirs, as DeepSeek's) and longrope's √(1 + ln factor / ln L) (1 for a factor ≤ 1; its factor
        where config.json has none: the model's `max_position_embeddings` ÷ L, as transformers 5 computes it); 1 for
        the other scalings."""
        if self.kind not in ("yarn", "longrope"):
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        context = self.original_max_position_embeddings
        if self.kind == "longrope":
            factor = self.factor
            if factor is None:
                assert context is not None and max_position_embeddings is not None
                factor = max_position_embeddings / context
            assert context is not None
            return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(context))
        assert self.factor is not None
        if self.mscale is not None and self.mscale_all_dim is not None:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    def yarn_band(self, head_dim: int, theta: float) -> tuple[float, float]:
        """yarn's ramp over the frequency index i < head_dim/2: from `low` (a frequency there and before it kept) to
        `high` (there and after it ÷ factor), the indices whose frequency turns beta_fast and beta_slow times over the
        pretraining context, rounded outwards unless `truncate` is false; high > low."""
        context = self.original_max_position_embeddings
        assert self.kind == "yarn" and context is not None

        def index(turns: float) -> float:  # the i where context·θ^(-2i/d) = 2π·turns
            return head_dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low = index(YARN_BETA_FAST if self.beta_fast is None else self.beta_fast)
        high = index(YARN_BETA_SLOW if self.beta_slow is None else self.beta_slow)
        if self.truncate is not False:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        return low, high + 0.001 if high == low else high  # (transformers' guard against 0/0)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def resolved(s: RopeScaling | None, max_position_embeddings: int) -> RopeScaling | None:
    """`s` with llama3's or yarn's pretraining context set: max_position_embeddings where config.json has none, as
    transformers 5 (`standardize_rope_params`) and vLLM 0.32 (which calls it) compute."""
    if s is None or s.kind not in ("llama3", "yarn") or s.original_max_position_embeddings is not None:
        return s
    return dataclasses.replace(s, original_max_position_embeddings=max_position_embeddings)


def max_positions(max_position_embeddings: int, s: RopeScaling | None) -> int:
    """The longest sequence (prompt + output) a model is run on: vLLM's derived `max_model_len` (vllm/config/model.py
    `_get_and_verify_max_len`), which transformers does not bound: a 'linear' scaling multiplies max_position_embeddings
    by its factor; llama3's, longrope's and yarn's max_position_embeddings is already the scaled context (vLLM 0.32:
    "YaRN variants leave max_position_embeddings already scaled", as transformers' `_compute_yarn_parameters` assumes),
    versus yarn's original_max_position_embeddings × factor, which vLLM refuses to start with where it is more
    (Qwen3's 32768 × 4 against its 40960)."""
    if s is None or s.kind != "linear":
        return max_position_embeddings
    assert s.factor is not None
    return int(max_position_embeddings * s.factor)


def positions_said(max_position_embeddings: int, s: RopeScaling | None) -> str | None:
    """How `max_positions` came from config.json where a scaling multiplied it (None where it is
    max_position_embeddings): `max_position_embeddings 4096 × 'linear' factor 4`."""
    if s is None or s.kind != "linear":
        return None
    assert s.factor is not None
    return f"max_position_embeddings {max_position_embeddings} × {s.kind!r} factor {s.factor:g}"


def longrope_refusal(s: RopeScaling | None, context: int) -> str | None:
    """Why an engine cannot sample as transformers does (and as the trainer scores) sequences of up to `context`
    tokens of a longrope model, or None: past its pretraining context L transformers switches from short_factor to
    long_factor by the length of each pass (re-encoding a sequence that crosses L mid-generation; a batch by its widest
    row) and vLLM by max_model_len, for every sequence; rlctl's engines and trainers agree with both up to L."""
    if s is None or s.kind != "longrope" or context <= (limit := s.original_max_position_embeddings or context):
        return None
    return (
        f"pass original_max_position_embeddings {limit} of RoPE 'longrope', past which transformers switches from "
        "short_factor to long_factor by each pass's length (re-encoding a sequence that crosses it mid-generation) "
        "and vLLM by max_model_len for every sequence: engine and trainer would disagree"
    )


def read_rope(
    d: Mapping[str, Any], bad: Bad, *, supported: str, phi3: bool = False
) -> tuple[float, RopeScaling | None]:
    """θ and the scaling of RoPE from `rope_theta` and `rope_scaling`, or transformers-5 `rope_parameters` (θ inside);
    other scalings are refused, saying `supported` (the architecture's) after "supported". Both keys given must say
    the same (transformers reads `rope_scaling` alone then). RoPE on part of each head (`partial_rotary_factor`) is
    a Phi3's alone (`phi3`: read by `rotary_fraction`), refused for the others; so is 'longrope', whose pretraining
    context and factors' length the caller checks against the model (`fit_to_heads`)."""
    found: dict[str, tuple[float, RopeScaling | None]] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if d.get(key) is not None:
            found[key] = _rope_entry(d[key], d.get("rope_theta", 10000.0), key, bad, supported, phi3=phi3)
    if len(found) == 2 and found["rope_scaling"] != found["rope_parameters"]:
        raise bad("rope_parameters", f"says {d['rope_parameters']!r}, rope_scaling {d['rope_scaling']!r}; keep one")
    if not phi3:
        _whole_rotary(d, "", bad)
    theta, scaling = next(iter(found.values()), (d.get("rope_theta", 10000.0), None))
    top = d.get("original_max_position_embeddings")
    if not phi3 and scaling is not None and scaling.kind in ("llama3", "yarn") and top is not None:
        said = scaling.original_max_position_embeddings  # (standardize_rope_params: the top-level key wins over it)
        if top != said:
            raise bad(
                "original_max_position_embeddings",
                f"{top!r} at the top of config.json, which transformers and vLLM put over RoPE {scaling.kind!r}'s "
                f"{'(none: max_position_embeddings)' if said is None else said}; give it in the RoPE entry alone",
            )
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise bad("rope_theta", f"{theta!r} is not a positive number")
    return float(theta), scaling


def rotary_fraction(d: Mapping[str, Any], bad: Bad) -> float:
    """A Phi3's `partial_rotary_factor` (RoPE on the first fraction of each head's dimensions, Phi-4-mini's 0.75) as
    Phi3Config reads it: its rope entry's, else the top-level key's, else 1; a number in (0, 1]."""
    key = next((k for k in ("rope_scaling", "rope_parameters") if isinstance(d.get(k), dict)), None)
    where, v = "partial_rotary_factor", d.get("partial_rotary_factor", 1.0)
    if key is not None and "partial_rotary_factor" in d[key]:
        where, v = f"{key}.partial_rotary_factor", d[key]["partial_rotary_factor"]
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise bad(where, f"{v!r} is not a fraction of a head's dimensions (a number above 0, at most 1)")
    return float(v)


def fit_to_heads(
    d: Mapping[str, Any],
    s: RopeScaling | None,
    fraction: float,
    *,
    head_dim: int,
    explicit: bool,
    context: int,
    bad: Bad,
) -> RopeScaling | None:
    """A Phi3's scaling checked against its heads (`head_dim`; `explicit`: config.json's head_dim is not hidden_size /
    num_attention_heads): RoPE turns int(head_dim × `fraction`) dimensions (as transformers truncates it; even, not 0:
    its halves are the pairs a frequency turns); longrope's pretraining context L set, the top-level
    original_max_position_embeddings (`context`: Phi3Config's, which transformers puts over the entry's; an entry
    saying another is refused), and short_factor and long_factor each of one number per frequency."""
    dims = int(head_dim * fraction)
    if fraction != 1 and (dims < 2 or dims % 2):
        raise bad("partial_rotary_factor", f"{fraction:g} of head_dim {head_dim} is {dims} dimensions; give a fraction "
                                           "whose dimensions are even and not 0")  # fmt: skip
    if s is None or s.kind != "longrope":
        return s
    key = "rope_scaling" if d.get("rope_scaling") is not None else "rope_parameters"
    if explicit:  # (Phi3Config.validate_rope against its rotary embedding)
        raise bad(
            "head_dim",
            f"{head_dim} is not hidden_size / num_attention_heads {d['hidden_size'] // d['num_attention_heads']}: "
            "transformers checks RoPE 'longrope''s factors against the one and computes with the other, and loads no "
            "such model",
        )
    if s.original_max_position_embeddings not in (None, context):
        raise bad(
            f"{key}.original_max_position_embeddings",
            f"{s.original_max_position_embeddings} is not the top-level original_max_position_embeddings {context} "
            "(transformers reads that one); give one",
        )
    for name, factors in (("short_factor", s.short_factor), ("long_factor", s.long_factor)):
        assert factors is not None
        if len(factors) != dims // 2:
            raise bad(f"{key}.{name}", f"has {len(factors)} numbers; RoPE 'longrope' needs one per frequency: "
                                       f"{dims // 2} (head_dim × partial_rotary_factor / 2)")  # fmt: skip
    return dataclasses.replace(s, original_max_position_embeddings=context)


def _whole_rotary(d: Mapping[str, Any], where: str, bad: Bad) -> None:
    """RoPE on every dimension of a head: a `partial_rotary_factor` (Phi-4-mini's 0.75 at the top of config.json;
    transformers 5 writes a Phi3's 1.0 into its rope_parameters) other than 1 is refused but for a Phi3, naming it
    (`where` + key)."""
    v = d.get("partial_rotary_factor", 1.0)
    if isinstance(v, bool) or v != 1:
        raise bad(
            f"{where}partial_rotary_factor",
            f"{v!r} is not supported (RoPE on part of each head); supported: 1.0, every dimension of a head rotated "
            "(other fractions: Phi3 only)",
        )


def _rope_entry(
    rope: Any, theta: Any, key: str, bad: Bad, supported: str, *, phi3: bool
) -> tuple[Any, RopeScaling | None]:
    if not isinstance(rope, dict):
        raise bad(key, f"{rope!r} is not a mapping; supported{supported}")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if phi3 and kind == "su":  # the 128k Phi-3s' older files: Phi3Config and vLLM read it as longrope (written so)
        kind = "longrope"
    keys = _KEYS.get(kind) if isinstance(kind, str) else None
    if keys is None or (kind == "longrope" and not phi3) or (phi3 and kind not in _PHI3_KINDS):
        raise bad(key, f"RoPE {kind!r} is not supported; supported{supported}")
    needed, optional = keys
    if extra := sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor", *needed, *optional}):
        raise bad(key, f"{extra} with RoPE {kind!r} is not supported; supported{supported}")
    if not phi3:
        _whole_rotary(rope, f"{key}.", bad)
    theta = rope.get("rope_theta", theta)
    if kind == "default":
        return theta, None
    got: dict[str, Any] = {}
    for name in (*needed, *optional):
        v = rope.get(name)
        if v is None and name in needed:
            raise bad(f"{key}.{name}", f"missing; RoPE {kind!r} needs {', '.join(needed)}")
        if v is not None:
            got[name] = _value(v, f"{key}.{name}", bad)
    if kind == "yarn":
        return theta, _yarn(got, key, bad)
    if kind == "longrope":
        return theta, RopeScaling("longrope", **{"factor": None, **got})
    if kind == "linear":
        return theta, RopeScaling("linear", got["factor"])
    low, high = got["low_freq_factor"], got["high_freq_factor"]
    if high <= low:  # (the band between them is interpolated over high − low)
        raise bad(f"{key}.high_freq_factor", f"{high:g} is not above low_freq_factor {low:g}")
    return theta, RopeScaling("llama3", got["factor"], low, high, got.get("original_max_position_embeddings"))


def _value(v: Any, where: str, bad: Bad) -> Any:
    """A scaling's value as its key says: `truncate` true or false, the pretraining context a positive integer,
    longrope's factors a list of positive numbers (a tuple of floats), the others a positive number (a float)."""
    if where.endswith(("short_factor", "long_factor")):
        if not isinstance(v, list) or not v:
            raise bad(where, f"{v!r} is not a list of positive numbers (one per frequency)")
        return tuple(_value(x, f"{where}[{i}]", bad) for i, x in enumerate(v))
    if where.endswith(".truncate"):
        if not isinstance(v, bool):
            raise bad(where, f"{v!r} is not true or false")
        return v
    integral = where.endswith(".original_max_position_embeddings")
    if isinstance(v, bool) or not isinstance(v, int if integral else int | float) or v <= 0:
        raise bad(where, f"{v!r} is not a positive {'integer' if integral else 'number'}")
    return v if integral else float(v)


def _yarn(got: dict[str, Any], key: str, bad: Bad) -> RopeScaling:
    """yarn's scaling; refused where transformers would warn that it computes something else than YaRN: a factor below
    1 (a shorter context), beta_fast below beta_slow (the ramp reversed)."""
    if got["factor"] < 1:
        raise bad(f"{key}.factor", f"{got['factor']:g} is below 1; YaRN's factor is the context's extension, ≥ 1")
    fast, slow = got.get("beta_fast", YARN_BETA_FAST), got.get("beta_slow", YARN_BETA_SLOW)
    if fast < slow:
        raise bad(f"{key}.beta_fast", f"{fast:g} is below beta_slow {slow:g}; YaRN keeps the faster-turning dimensions")
    return RopeScaling("yarn", **got)
