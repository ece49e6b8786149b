"""Data as the agents hold it: data folders, image sets, tables and each agent's own files checked
against the schema."""
