"""unstep exporter: PyTorch reference of the Wan2.1 / Self-Forcing family and ONNX bundle writer."""

EXPORTER_VERSION = "0.13.0"
