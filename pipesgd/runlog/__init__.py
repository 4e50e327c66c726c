"""What a run records, and how: output paths checked before work starts (``output_paths``), Chrome/Perfetto traces
(``trace``; ``python -m pipesgd.runlog.trace merge``) and the communication path's phase timers (``phases``).
"""
