"""ESA's CPU retrieval (retrieval_backend), as UCM's ucm.sparse.esa.retrieval package has it."""
