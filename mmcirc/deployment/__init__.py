"""Deployment helpers: ONNX export of whole models (:mod:`mmcirc.deployment.onnx`)."""
