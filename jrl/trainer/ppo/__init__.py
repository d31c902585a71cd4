"""The PPO family (verl's ray trainer): the roles it builds and one step in verl's order."""
