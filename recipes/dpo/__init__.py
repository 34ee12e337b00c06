from recipes.dpo.recipe import DPOConfig, DPORecipe as Recipe

__all__ = ["Recipe", "DPOConfig"]
