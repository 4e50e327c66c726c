"""Micro-benchmarks of the trainer's parts on a live process group: the shared slowest-rank timing loop
(``timing``), the all-reduce and local reduction (``allreduce``), compute loads (``compute``), host interference,
copy and hand-off (``host``), and the whole calibration run (``calibrate``) that ``pipesgd-timing calibrate`` fits.
"""
from pipesgd.measure.timing import median_of_slowest, synchronize, time_calls, time_collective, time_local

__all__ = ["median_of_slowest", "synchronize", "time_calls", "time_collective", "time_local"]
