"""Learning tasks: models (models.py), objectives (objective.py, logreg.py), the tasks by name
(catalog.py), the centralized optimum (optimum.py) and a trained model on disk (model_io.py);
the data they read is efpsn/data/'s. Each name is imported from the module that defines it."""
