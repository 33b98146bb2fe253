"""Checkpoints and resume: the files of a checkpoint and their manifests (`files`), which checkpoint a resume
uses (`choose`), the trainer's part (`trainer`: policy, optimizer and RNG shards) and the controller's
(`controller`: ledger, iteration, ranker, rebalance window)."""
