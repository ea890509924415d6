//! The engine: everything that touches ONNX Runtime and the GPU lives here and only here.
