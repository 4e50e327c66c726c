"""The experiments: thin driver scripts, their configs and committed results, and the harness they share
(``experiments/harness``: runners, reports, plots, notebook helpers, result storage). Not part of the shipped
package; run from the repository root (``python experiments/<script>.py``), which puts this folder's parent on
``sys.path``."""
