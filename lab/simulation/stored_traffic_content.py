"""Phrases the traffic simulator builds prompts and answers from, per line and language."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LineContent:
    """Building blocks of one business line's conversations in one language."""

    system: str
    questions: tuple[str, ...]
    context: tuple[str, ...]
    helpful_opening: str
    steps: tuple[str, ...]
    helpful_closing: str
    poor_answers: tuple[str, ...]


CONTENT: dict[tuple[str, str], LineContent] = {
    ("customer_service", "en"): LineContent(
        system="You are a courteous customer service assistant for an online store.",
        questions=(
            "My package has not arrived yet, what should I do?",
            "How do I return a pair of shoes that do not fit?",
            "I was charged twice for the same order.",
            "Can I change the delivery address of an order I already placed?",
            "The coupon code does not work at checkout.",
            "How long does a refund take to reach my bank account?",
            "I forgot my password and the reset email never came.",
            "Do you ship to Canada and how much does it cost?",
        ),
        context=(
            "I ordered it last week.",
            "This is the second time this happened.",
            "I already tried restarting the app.",
            "The tracking page has not changed for four days.",
            "I need it before the weekend because it is a gift.",
            "Your chat bot sent me in circles yesterday.",
            "I have been a customer for years and never had this problem.",
        ),
        helpful_opening="I'm sorry for the trouble, here is how we can fix it. ",
        steps=(
            "First, open Orders in your account and select the order. ",
            "Then choose 'Report a problem' and pick the reason that fits. ",
            "We will email you a prepaid return label within one hour. ",
            "Refunds reach your bank within 3 to 5 business days after we receive the item. ",
            "If the tracking has not moved for 5 days, we will reship the order at no cost. ",
            "You can also reach a human agent from the Help page, 8am to 8pm. ",
        ),
        helpful_closing="Is there anything else I can help you with?",
        poor_answers=(
            "Please check our FAQ.",
            "I cannot help with that.",
            "Contact support.",
            "That is not possible.",
        ),
    ),
    ("customer_service", "zh"): LineContent(
        system="你是一家网店的客服助手，回答要礼貌、具体。",
        questions=(
            "我的快递还没到，怎么办？",
            "鞋子尺码不合适，怎么退货？",
            "同一个订单被扣了两次钱。",
            "下单后还能修改收货地址吗？",
            "优惠券在结算时用不了。",
            "退款多久能到账？",
            "忘记密码了，重置邮件一直收不到。",
        ),
        context=(
            "我是上周下的单。",
            "这已经是第二次了。",
            "我已经重启过应用了。",
            "物流信息四天没有更新。",
            "周末之前要用，是送人的礼物。",
        ),
        helpful_opening="非常抱歉给您带来不便，我们可以这样处理：",
        steps=(
            "先在“我的订单”里找到这笔订单，",
            "点击“申请售后”，选择对应的原因，",
            "我们会在一小时内发送免费退货面单，",
            "收到退货后3到5个工作日内退款到账，",
            "物流超过5天未更新的，我们免费补发，",
            "也可以在帮助页面联系人工客服（早8点到晚8点），",
        ),
        helpful_closing="请问还有其他可以帮您的吗？",
        poor_answers=("请查看常见问题。", "这个我帮不了。", "请联系客服。", "不行。"),
    ),
    ("medical", "en"): LineContent(
        system="You are a careful medical information assistant. You do not diagnose.",
        questions=(
            "I have had a headache for three days, should I worry?",
            "Can I take ibuprofen together with my blood pressure medication?",
            "What are the early signs of diabetes?",
            "My child has a fever of 38.5 degrees, what should I do?",
            "How much sleep does an adult really need?",
            "Is it safe to exercise with a mild cold?",
        ),
        context=(
            "I am 45 years old.",
            "I do not have any allergies that I know of.",
            "It gets worse in the evening.",
            "I already drink a lot of water.",
            "My doctor is on holiday this week.",
        ),
        helpful_opening="I can share general information, not a diagnosis. ",
        steps=(
            "Keep track of when the symptoms start and how strong they are. ",
            "Check the leaflet of each medicine for interactions, or ask a pharmacist. ",
            "Seek urgent care if you notice chest pain, confusion or trouble breathing. ",
            "Rest, fluids and a regular sleep schedule help most mild cases. ",
            "Book an appointment with your doctor if it lasts more than a week. ",
        ),
        helpful_closing="Please contact a medical professional for advice about your situation.",
        poor_answers=(
            "Just take some pills.",
            "It is probably nothing.",
            "Google it.",
            "I don't know.",
        ),
    ),
    ("medical", "zh"): LineContent(
        system="你是谨慎的医疗信息助手，不做诊断。",
        questions=(
            "头疼三天了，需要担心吗？",
            "布洛芬能和降压药一起吃吗？",
            "糖尿病早期有哪些症状？",
            "孩子发烧38.5度，该怎么办？",
            "成年人到底需要睡多久？",
        ),
        context=("我今年45岁。", "我没有已知的过敏。", "晚上会更严重。", "我平时喝水很多。"),
        helpful_opening="我可以提供一般性的健康信息，但不能代替诊断。",
        steps=(
            "记录症状开始的时间和严重程度，",
            "查看药品说明书中的相互作用，或咨询药师，",
            "出现胸痛、意识模糊或呼吸困难请立即就医，",
            "多休息、多喝水、规律作息对大多数轻症有帮助，",
            "持续超过一周请预约医生，",
        ),
        helpful_closing="具体情况请咨询专业医生。",
        poor_answers=("吃点药就好了。", "应该没事。", "自己上网查吧。", "不知道。"),
    ),
    ("legal", "en"): LineContent(
        system="You are a legal information assistant. You do not give legal advice.",
        questions=(
            "My landlord will not return my deposit, what can I do?",
            "Can my employer change my working hours without notice?",
            "Do I need a lawyer to write a simple will?",
            "What should a freelance contract include?",
            "Someone copied photos from my website, is that legal?",
            "How long do I have to dispute a parking fine?",
        ),
        context=(
            "I live in a rented flat.",
            "We never signed anything in writing.",
            "The contract is two years old.",
            "I sent them an email last month and got no answer.",
        ),
        helpful_opening="Here is general legal information, not legal advice. ",
        steps=(
            "Collect every written record: contracts, emails, receipts and photos. ",
            "Send a dated written request that states what you expect and by when. ",
            "Check the deadline that applies, since many claims expire after a fixed period. ",
            "A local legal aid office can review your documents for free or at low cost. ",
            "Small claims court handles most disputes under a set amount without a lawyer. ",
        ),
        helpful_closing="For advice on your case, talk to a qualified lawyer in your jurisdiction.",
        poor_answers=("Sue them.", "That is illegal.", "Ask a lawyer.", "No idea."),
    ),
    ("legal", "zh"): LineContent(
        system="你是法律信息助手，不提供正式法律意见。",
        questions=(
            "房东不退押金，我该怎么办？",
            "公司可以不通知就改我的工作时间吗？",
            "写一份简单的遗嘱需要律师吗？",
            "自由职业合同应该包括哪些内容？",
            "别人盗用了我网站上的照片，这合法吗？",
        ),
        context=("我住的是租的房子。", "我们没有签书面合同。", "合同是两年前签的。"),
        helpful_opening="以下是一般性的法律信息，不构成法律意见。",
        steps=(
            "收集所有书面材料：合同、聊天记录、收据和照片，",
            "发一份注明日期的书面通知，写清诉求和期限，",
            "注意诉讼时效，很多请求超过期限就不受保护，",
            "当地法律援助机构可以免费或低价帮您审阅材料，",
            "小额纠纷可以通过小额诉讼程序解决，",
        ),
        helpful_closing="具体案件请咨询执业律师。",
        poor_answers=("去告他。", "这是违法的。", "问律师吧。", "不清楚。"),
    ),
}

FLOODS: dict[str, tuple[str, ...]] = {
    "en": (
        "Where is my order #{n}? It was supposed to arrive on the {day}th.",
        "Hi, I want to cancel order {n} please.",
        "Please send me the invoice for order number {n}.",
    ),
    "zh": (
        "我的订单{n}到哪里了？说好{day}号到的。",
        "你好，我要取消订单{n}。",
        "请把订单{n}的发票发给我。",
    ),
}
