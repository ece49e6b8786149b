"""Generated protobuf and gRPC stubs for package efpsn.v1 (regenerate with scripts/gen_proto.sh)."""
