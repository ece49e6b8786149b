"""Wire format of EFPSN: protobuf contract, stubs, conversions and transport limits."""
