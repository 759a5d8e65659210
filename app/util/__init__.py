"""Small shared helpers: atomic writes, errors, hashing, system facts."""
