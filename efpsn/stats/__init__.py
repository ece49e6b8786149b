"""The secure sum of column statistics and the standardisation it feeds (`--scale standard`)."""
