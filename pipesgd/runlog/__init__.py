"""What a run records, and how: per-rank file names (``run_files``), atomic
writes (``atomic``), output paths checked before work starts (``output_paths``), Chrome/Perfetto traces
(``trace``; ``python -m pipesgd.runlog.trace merge``) and the communication path's phase timers (``phases``).
Torch-free where the timing model reads it (``run_files``, ``atomic``).
"""
