"""Learning tasks: data (public sets, agent-local files: data.py, local.py), models (models.py),
objectives (objective.py, logreg.py), the tasks by name (catalog.py), the centralized optimum
(optimum.py). Each name is imported from the module that defines it."""
