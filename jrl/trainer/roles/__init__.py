"""The models a step uses: actor, reference, critic and reward model, each built from a spec
resolved once from the config."""
