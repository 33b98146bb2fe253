"""The agents of a running job: controller, rollout and trainer processes, and their wire messages.

`core.py` is the controller's logic without I/O (its parts: `corestate.py`, `admission.py`, `delivery.py`,
`unitloss.py`, `migrating.py`; its types `coretypes.py`), `ledger.py` the sample ledger, `staleness.py` the
staleness rule, `scaling.py` the controller's `Scaler` (on its layers `healing.py`, lost units replaced, and
`unitstarts.py`, units starting; where units run: `placement.py`); `controller.py` (its parts in `controller_*.py`),
`rollout.py` and `trainer.py` are the processes;
`__main__.py` their entry point (`python -m rlctl.agents ROLE --job-dir DIR`).
"""
