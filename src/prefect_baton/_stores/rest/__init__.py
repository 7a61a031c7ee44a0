"""The REST client store: every operation through the REST API."""
