"""Supervised fine-tuning (verl's SFT trainer): its step and its loss."""
