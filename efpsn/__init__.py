"""EFPSN: private and accurate decentralized optimization. From Python (notebooks):
`from efpsn.notebook import train` (efpsn/notebook.py); the command line is `efpsn`."""
