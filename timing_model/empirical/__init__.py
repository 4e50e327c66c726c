"""The timing model's empirical terms: what ``calibrate`` (or a run's own records) measures on one cluster beyond
the analytic core's plain inputs, each with a neutral value that turns it off.

``terms`` holds them in one frozen record (``EmpiricalTerms``); ``anchor`` replaces the α-β fit by a timing at
the workload's size; ``overlap`` prices compute and communication sharing cores (κ, κc, λ) and the hand-off;
``server`` the parameter server's socket buffer, queue and co-located worker; ``host_terms`` derives the terms
from calibrate's probe timings and from a calibration file's ``host`` record.
"""
