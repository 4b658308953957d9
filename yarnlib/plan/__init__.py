"""``yarnlib plan``: will a long-context run fit, and with which engine settings."""
