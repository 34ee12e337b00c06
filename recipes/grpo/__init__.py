from recipes.grpo.recipe import GRPOConfig, GRPORecipe as Recipe

__all__ = ["Recipe", "GRPOConfig"]
