"""Importable on the driver only (the osmosis-ray tests add this folder to the driver's sys.path)."""
