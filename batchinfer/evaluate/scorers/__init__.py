"""The scorers: what an evaluation's task decides (evaluate/scoring.py has the protocol).

- classify.py (with classify_metrics.py, classify_report.py): top-k accuracy, confusion,
  agreement and cosine with the reference, McNemar against the baseline;
- instances.py (with instances_items.py, instances_metrics.py, instances_examples.py,
  instances_report.py, instances_summary.py, instances_plots.py, and COCO's scoring in
  coco.py and coco_bootstrap.py): detection scored the COCO way.
"""
