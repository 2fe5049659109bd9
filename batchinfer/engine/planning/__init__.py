"""Planning a run: settings and dataset in, an EnginePlan out, before any process starts.

RunConfig (config.py) and the files it names become a Plan (plan.py, its manifest records
in plan_records.py): the model's inputs and task (model_metadata.py, batchinfer.tasks),
cores, CPUs (affinity.py), instances per core (instances.py; the ``-k auto`` measurement
itself runs a child, so it is engine/board/instance_probe.py) and slots. The EnginePlan and
EngineResult the loop takes and gives are in interface.py. Planning starts no process and
imports nothing of the board's plumbing (tests/test_import_layers.py).
"""
