"""What the experiment scripts run, kept in the package so the scripts stay thin: the trainer variants they
compare (``variants``), the issue-4 speed comparison (``speed``) and the timing-model fidelity run (``fidelity``,
``fidelity_report``). Timing loops come from ``pipesgd.measure``.
"""
