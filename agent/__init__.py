"""The EFPSN agent: one gRPC service per agent, running phase I and phase II with its neighbours."""
