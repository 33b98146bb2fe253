"""How big a version's manifest is, without torch: `rlctl check` sizes it against the bound a receiver puts on a
message header, where it travels (one xxh3 per chunk; `versions.Payload.manifest`)."""

from __future__ import annotations

from rlctl.transport.framing import Limits

BUCKET_BYTES = 64 << 20  # `versions.WeightSyncConfig.bucket_bytes`: a chunk never spans two buckets
# what the checksums may take of a header; the rest is the layout (a name, dtype and shape per tensor)
MANIFEST_BOUND = Limits.max_header_bytes // 2
SUM_BYTES = 9  # one xxh3-64 in msgpack (0xcf + 8 bytes)


def chunk_count(total_bytes: int, *, bucket_bytes: int, chunk_bytes: int) -> int:
    """len(chunks.cut(total_bytes, ...)), without building it."""
    full, rest = divmod(total_bytes, bucket_bytes)
    return full * -(-bucket_bytes // chunk_bytes) + -(-rest // chunk_bytes)


def manifest_bytes(weights_bytes: int, *, chunk_bytes: int, bucket_bytes: int = BUCKET_BYTES) -> int:
    """The checksums of a full version of `weights_bytes` as its manifest carries them."""
    return SUM_BYTES * chunk_count(weights_bytes, bucket_bytes=bucket_bytes, chunk_bytes=chunk_bytes)


def least_chunk_bytes(weights_bytes: int, *, bucket_bytes: int = BUCKET_BYTES) -> int:
    """The smallest power-of-two chunk whose manifest (in buckets of `bucket_bytes`) fits; a bucket's worth at
    most (`chunks.cut` takes no longer chunk), where none smaller fits."""

    def fits(chunk: int) -> bool:
        return manifest_bytes(weights_bytes, chunk_bytes=chunk, bucket_bytes=bucket_bytes) <= MANIFEST_BOUND

    chunk = 1 << 10
    while chunk < bucket_bytes and not fits(chunk):
        chunk *= 2
    return min(chunk, bucket_bytes)
