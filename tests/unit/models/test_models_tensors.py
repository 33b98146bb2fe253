"""`CheckpointTensors` reads what `weightfiles.load_state_dict` reads (fp32) from each layout of a checkpoint directory:
one model.safetensors, an index and its shards, a pytorch_model.bin; its shapes from the headers alone. `ModelTensors`
reads a Phi3 file's fused tensors under the model's names; `copy_into` loads and refuses what `TinyGPT.load_weights`
does."""

from __future__ import annotations

import dataclasses
import re
import weakref
from pathlib import Path

import pytest
import torch

from rlctl.errors import ConfigError
from rlctl.models import hf, hfnames, weightfiles
from rlctl.models.tensors import CheckpointTensors, DoesNotFit, ModelTensors, copy_into
from rlctl.models.tinygpt import TinyGPT
from tests.unit.tiny_models import misfits, small_config


@pytest.mark.parametrize("layout", ["one-file", "shards", "torch-bin"])
def test_each_tensor_is_the_whole_reads(tmp_path: Path, layout: str) -> None:
    torch.manual_seed(0)
    d = TinyGPT(small_config()).save_pretrained(tmp_path / "model")
    sd = {k: v.to(torch.bfloat16) for k, v in weightfiles.load_state_dict(d).items()}  # read back in fp32
    for f in weightfiles.weight_files(d):
        f.unlink()
    if layout == "torch-bin":
        torch.save(sd, d / weightfiles.TORCH_FILE)
    else:
        weightfiles.save_state_dict(sd, d, max_shard_bytes=20_000 if layout == "shards" else None)
    assert (d / weightfiles.INDEX_FILE).exists() == (layout == "shards")
    whole, tensors = weightfiles.load_state_dict(d), CheckpointTensors(d)
    assert list(tensors) == list(whole) and len(tensors) == len(whole) and "lm_head.bias" not in tensors
    assert tensors.shapes() == {k: tuple(v.shape) for k, v in whole.items()}
    for k, v in whole.items():
        assert tensors[k].dtype == torch.float32 and torch.equal(tensors[k], v), k


def test_a_phi3_file_reads_under_the_models_names_each_fused_tensor_once(tmp_path: Path) -> None:
    """A Phi3 file holds q/k/v as one qkv_proj and gate/up as one gate_up_proj (`hfnames.fusions`); `ModelTensors` reads
    it under the model's names, each part its rows, a fused tensor read once for its parts."""
    torch.manual_seed(0)
    model = TinyGPT(dataclasses.replace(small_config(heads=4), architecture=hf.PHI3))
    d = model.save_pretrained(tmp_path / "model")
    file = CheckpointTensors(d)
    assert "model.layers.0.self_attn.qkv_proj.weight" in file and "model.layers.0.self_attn.q_proj.weight" not in file
    assert file.shapes() == hfnames.file_shapes(model.config)
    reads: list[str] = []
    read = CheckpointTensors.__getitem__

    def counted(self: CheckpointTensors, name: str) -> torch.Tensor:
        reads.append(name)
        return read(self, name)

    tensors = ModelTensors(file, model.config)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(CheckpointTensors, "__getitem__", counted)
        got = {k: tensors[k] for k in tensors}
    want = model.state_dict()
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert reads == list(file) and "model.layers.0.mlp.gate_up_proj.weight" not in tensors
    assert dict(ModelTensors(got, small_config())) == got  # the other architectures' files: the model's names


@pytest.mark.parametrize("tied", [False, True])
def test_copy_into_loads_what_load_weights_loads_and_refuses_what_it_refuses(tmp_path: Path, tied: bool) -> None:
    cfg = small_config()
    cfg.tie_word_embeddings = tied
    torch.manual_seed(0)
    d = TinyGPT(cfg).save_pretrained(tmp_path / "model")
    optional = {"lm_head.weight"} if tied else set()
    mine, theirs = TinyGPT(cfg), TinyGPT(cfg)
    copy_into(mine, CheckpointTensors(d), optional=optional)
    theirs.load_weights(weightfiles.load_state_dict(d))
    assert all(torch.equal(mine.state_dict()[k], v) for k, v in theirs.state_dict().items())
    assert (mine.lm_head.weight is mine.model.embed_tokens.weight) == tied  # a tied model stays tied

    whole = weightfiles.load_state_dict(d)
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    for bad, complaint in misfits(whole, list(before)):
        with pytest.raises(DoesNotFit, match=f"^{re.escape(complaint)}$"):
            theirs.load_weights(bad)
        with pytest.raises(DoesNotFit, match=f"^{re.escape(complaint)}$"):
            copy_into(mine, {k: v + 1 for k, v in bad.items()}, optional=optional)
        assert all(torch.equal(mine.state_dict()[k], v) for k, v in before.items())  # nothing copied


def test_a_phi3_files_shapes_under_the_models_names_come_from_its_headers(tmp_path: Path) -> None:
    """`ModelTensors.shapes()`: each part of a fused tensor its rows of it, read from the file's headers alone — what
    `copy_into` checks a resumed torch rank's Phi3 against before it copies (versus every fused tensor read for it)."""
    model = TinyGPT(dataclasses.replace(small_config(heads=4), architecture=hf.PHI3))
    tensors = ModelTensors(CheckpointTensors(model.save_pretrained(tmp_path / "model")), model.config)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(CheckpointTensors, "__getitem__", lambda self, name: pytest.fail(f"{name} read"))
        shapes = tensors.shapes()
    assert shapes == {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight" or k in shapes}
    twin = TinyGPT(model.config)
    copy_into(twin, tensors)
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), model.state_dict().values(), strict=True))


@pytest.mark.parametrize("architecture", [hf.LLAMA, hf.PHI3])
def test_load_weights_holds_one_tensor_of_a_lazy_mapping_at_a_time(tmp_path: Path, architecture: str) -> None:
    """`TinyGPT.load_weights` of a checkpoint's tensors read as they are asked for (`ModelTensors` of
    `CheckpointTensors`): each tensor read is let go once copied, versus torch's `load_state_dict`, which makes a dict
    of every tensor of the mapping first (the whole model beside the model)."""
    torch.manual_seed(0)
    model = TinyGPT(dataclasses.replace(small_config(layers=2, heads=4), architecture=architecture))
    d = model.save_pretrained(tmp_path / "model")
    alive: list[weakref.ref[torch.Tensor]] = []
    held: list[int] = []  # at each read: how many tensors read before it are still held
    read = CheckpointTensors.__getitem__

    def tracked(self: CheckpointTensors, name: str) -> torch.Tensor:
        held.append(sum(r() is not None for r in alive))
        t = read(self, name)
        alive.append(weakref.ref(t))
        return t

    twin = TinyGPT(model.config)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(CheckpointTensors, "__getitem__", tracked)
        twin.load_weights(ModelTensors(CheckpointTensors(d), model.config))
    assert len(held) == len(CheckpointTensors(d)) and max(held) <= 1  # (a Phi3's fused tensor, kept for its parts)
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), model.state_dict().values(), strict=True))


def test_from_pretrained_reads_past_what_a_file_holds_beyond_the_model(tmp_path: Path) -> None:
    """An older Llama's file holds `rotary_emb.inv_freq` buffers and a tied checkpoint's may hold `lm_head.weight`:
    `from_pretrained` reads the tensors `hfnames.match_weights` names (`ModelTensors(only=…)`), as without them."""
    cfg = dataclasses.replace(small_config(layers=2), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    d = model.save_pretrained(tmp_path / "model")
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(16), "lm_head.weight": model.lm_head.weight}
    whole = weightfiles.load_state_dict(d)
    weightfiles.save_state_dict({**whole, **{k: v.detach().clone() for k, v in extra.items()}}, d)
    assert set(extra) <= set(CheckpointTensors(d))
    loaded = TinyGPT.from_pretrained(d)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    got, want = loaded.state_dict(), model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_tied_model_refuses_a_file_whose_lm_head_is_not_its_embedding(tmp_path: Path) -> None:
    """A file of a tied config (tie_word_embeddings: true) holding an lm_head.weight other than its embedding is two
    tensors, which transformers loads untied; rlctl's tied model holds one: refused in one line, the model as it was,
    versus the file's embedding taken (`from_pretrained`) or overwritten by its lm_head (`copy_into`, a resume)."""
    transformers = pytest.importorskip("transformers")
    cfg = dataclasses.replace(small_config(), tie_word_embeddings=True)
    torch.manual_seed(0)
    d = TinyGPT(cfg).save_pretrained(tmp_path / "model")
    whole = weightfiles.load_state_dict(d)
    lm_head = whole["model.embed_tokens.weight"] + 1
    weightfiles.save_state_dict({**whole, "lm_head.weight": lm_head}, d)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert ref.lm_head.weight is not ref.model.embed_tokens.weight and torch.equal(ref.lm_head.weight, lm_head)

    said = "weights do not fit this model: lm_head.weight differs from model.embed_tokens.weight"
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{d}: {said}')}"):
        TinyGPT.from_pretrained(d)
    model = TinyGPT(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(DoesNotFit, match=f"^{re.escape(said)}"):
        copy_into(model, CheckpointTensors(d), optional={"lm_head.weight"})
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    tied = whole["model.embed_tokens.weight"].clone()  # equal: one
    weightfiles.save_state_dict({**whole, "lm_head.weight": tied}, d)
    copy_into(model, CheckpointTensors(d), optional={"lm_head.weight"})
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(torch.equal(model.state_dict()[k], v) for k, v in TinyGPT.from_pretrained(d).state_dict().items())
