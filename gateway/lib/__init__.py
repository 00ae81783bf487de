"""Model-free helpers shared by the apps."""
