"""Planning: Algorithm 1 (allocation), parallel-config search, Algorithm 2 (dispatch), LPT, rebalance, simulator.

    profile (rlctl.profiler) ─▶ costs.py: PTL(BS), train s/token ─▶ curves.py: P_gen(x), P_train(y)
                                                                        │
    workload.py: lengths, ranker ─▶ dispatch.py: LPT, Alg. 2 ─▶ sim.py ─┤
                                                                        ▼
                                     alloc.py: Alg. 1 ─▶ plan.py: one plan dict ─▶ view.py: table / PNG
                 (plan.py's parts: inputs, placement, search, predict, dispatchreport, weightsync, rebalance)

Everything here is pure (no I/O); `dispatch.py` is also used by the runtime controller.
"""
