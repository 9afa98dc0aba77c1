"""Perturbations of model inputs (images, tables) shared by the audits and the estimators' calibration."""
