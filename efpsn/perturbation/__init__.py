"""The functional perturbation: monomials on [-1, 1]^m, their orthonormal basis, the selected
parameters and Phi."""
