"""Localisation benchmark: does the first divergent item name the faulty site?"""
