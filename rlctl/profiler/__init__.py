"""Profiles: the cost functions the planner needs, modelled from GPU specs or measured on a site.

analytical.py   roofline decode / prefill / KV capacity / training cost from catalog specs
measure.py      microbenchmarks of a generation engine (the embedded CPU engine on `local`)
profile.py      the versioned profile file (apiVersion rlctl/v1, kind Profile): models, load, save
"""
