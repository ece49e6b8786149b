"""The bootstrap coordinator: registry (pure) and its gRPC service."""
