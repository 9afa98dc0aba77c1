"""Generated protobuf messages of the Open Inference Protocol's gRPC service (see README.md here)."""
