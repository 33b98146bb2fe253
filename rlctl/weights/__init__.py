"""The weight plane: versions of a policy's weights from the trainer to rollout units (StreamRL §6).

chunks       flat buffers, their layout, buckets and checksummed chunks
delta        the lossless delta codec between two versions (and delta_parts: its encoding split over ranks)
manifest     a version's manifest size (what `rlctl check` bounds), torch-free
versions     what one node holds: versions as full and delta payloads, the typed wire headers
node         WeightNode: publishes, relays and fetches versions over the tensor RPC (rlctl.transport)
plan         the broadcast tree: one copy per inter-DC link, chains per datacenter
"""
