"""Backends, one file each, behind two small interfaces (inference and training), chosen by name."""
