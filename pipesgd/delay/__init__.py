"""When a step's averaged gradient is applied, and what a rank does about the wait (the "delayed apply" stage):
the K-deep pipeline of in-flight steps (``pipeline``), and look-ahead staleness compensation (``lookahead``), which
replays the wrapped optimizer's rule (``replay``).
"""
