"""The sub-commands of ``pipesgd-timing``, one module each (``predict``, ``sweep``, ``calibrate``, ``validate``),
and the flags and helpers they share (``flags``). Each module offers ``add_parser(sub)`` and ``run(args)``.
"""
