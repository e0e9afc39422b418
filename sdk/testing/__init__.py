"""The conformance kit: certify a kvtier backend against the contract."""
