"""The experiment harness, apart from the shipped package: what the scripts in ``experiments/`` run (runners of the
comparison grid, the accuracy study, the fidelity check, the timeline, the micro-benchmarks), the trainer variants
they compare (``variants``), their reports and plots, the notebook runner and the committed-result store
(``provenance``). Module names carry their experiment: ``comparison_*``, ``accuracy*``, ``fidelity*``,
``timeline*``. Timing loops come from ``pipesgd.measure``; nothing in ``pipesgd`` imports this.
"""
