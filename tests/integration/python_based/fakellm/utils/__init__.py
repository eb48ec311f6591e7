"""The stand-in engine of the fakellm backend."""
