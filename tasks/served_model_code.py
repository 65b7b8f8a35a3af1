"""The code MLflow logs as the run's pyfunc model (MLflow's models-from-code): a run
passes this file's path as ``python_model``, MLflow copies the file beside the model and
runs it on loading, and :func:`mlflow.models.set_model` names the model. Loading thus
unpickles no object: the model is this code, :class:`tasks.served_model.ImageModel`, and
its classifier folder (weights read with ``weights_only=True``)."""

import mlflow.models

from tasks.served_model import ImageModel

mlflow.models.set_model(ImageModel())
