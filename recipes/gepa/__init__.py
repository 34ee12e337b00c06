from recipes.gepa.recipe import GEPARecipe as Recipe, GEPARecipeConfig

__all__ = ["Recipe", "GEPARecipeConfig"]
