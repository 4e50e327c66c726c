"""The analytic core of the timing model: the α-β-γ collective costs (``collectives``), the textbook per-mode
iteration equations (``equations``), one iteration's communication from the plain records (``costs``) and the
straggler's expected maximum (``straggler``).

Its inputs are the ones a user knows: workers p, gradient bytes M, latency α, bandwidth B = 1/β, reduction cost
γ, per-call overhead c0, compute and update time, the codec's ratio and throughput, the parameter servers.
Nothing measured on one cluster enters here; that is ``timing_model.empirical``, and with every one of its terms
neutral the modes (``timing_model.modes``) are these equations exactly.
"""
