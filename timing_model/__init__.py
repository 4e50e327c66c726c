"""timing_model: an analytic model of data-parallel iteration time (ps-sync, ps-async, sync, ddp, Pipe-SGD)
in latency, bandwidth, cluster size and compute time; calibrated on a real cluster and validated on real runs.

Pure functions of frozen parameter records. The analytic core (``core``: α-β-γ collective costs, the textbook
mode equations, in the paper's symbols) takes the plain inputs of ``params``; the empirical terms that
``calibrate`` measures (``empirical``: anchor, overlap slow-downs, lockstep, host work, server service) stretch
it in ``modes``, and with every one of them neutral the modes are the core exactly. ``predict`` returns named
breakdowns per mode; ``calibration`` and ``fitting`` fit measured timings (taken by ``pipesgd.measure``); ``cli``
and ``commands`` are the command line. Nothing here imports torch.
"""
from timing_model.calibration import Calibration, Fit, Sample, read_calibration, write_calibration
from timing_model.core.straggler import expected_max_exponential, expected_max_normal, expected_max_normal_factor
from timing_model.empirical.terms import NEUTRAL, EmpiricalTerms
from timing_model.fitting import fit_collective
from timing_model.modes import MODES, ModeResult, predict_mode
from timing_model.params import (CODEC_RATIOS, ClusterParams, CodecParams, ComputeParams, ScheduleParams,
                                 ServerParams, build_codec)
from timing_model.predict import Prediction, Scenario, predict, sweep
from timing_model.units import parse_bandwidth, parse_bytes, parse_count, parse_time
from timing_model.validation import read_runs, summarise, validate_runs

__all__ = [
    "MODES",
    "CODEC_RATIOS",
    "ClusterParams",
    "ComputeParams",
    "CodecParams",
    "ServerParams",
    "ScheduleParams",
    "build_codec",
    "EmpiricalTerms",
    "NEUTRAL",
    "ModeResult",
    "predict_mode",
    "Scenario",
    "Prediction",
    "predict",
    "sweep",
    "expected_max_normal",
    "expected_max_normal_factor",
    "expected_max_exponential",
    "Sample",
    "Fit",
    "Calibration",
    "fit_collective",
    "read_calibration",
    "write_calibration",
    "read_runs",
    "validate_runs",
    "summarise",
    "parse_bandwidth",
    "parse_bytes",
    "parse_count",
    "parse_time",
]
