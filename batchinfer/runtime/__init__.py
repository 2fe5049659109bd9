"""Runtimes with RKNNLite's shape: rknnlite (real), onnx (ONNX Runtime), sim (NPU emulator)."""
