"""The control plane's messages (`control`) and how a proc is started (`bootstrap_command`)."""
