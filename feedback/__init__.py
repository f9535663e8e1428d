"""feedback"""
