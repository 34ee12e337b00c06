from recipes.ctxd.recipe import CTXDConfig, CTXDRecipe as Recipe

__all__ = ["Recipe", "CTXDConfig"]
