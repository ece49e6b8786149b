"""The run's public parameters: their declarations, values, grammars, checks and the rules that
resolve them."""
