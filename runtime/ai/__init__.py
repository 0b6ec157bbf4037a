"""The PoP's side of the model worker: the service functions bind to and the OpenAI API."""
